"""sim/tokenizer.py: chat prompt layout (template opening, image placeholders, text, closing)."""
import io
import random

import pytest
from PIL import Image

from epdbench.sim.prefix_cache import block_hashes
from epdbench.sim.tokenizer import image_end_positions, image_size, placeholder_ids, prompt_ids, text_tokens
from epdbench.specs.workload import stand_in_image


def test_image_placeholders_follow_the_template_opening_and_end_where_said():
    images = [("00000a0b", 400), ("00000c0d", 900)]
    ids = prompt_ids("what is in the pictures", images, True, 23)
    ends = image_end_positions(images, 23)
    opening = 23 * 2 // 3
    assert ends == [opening + 400, opening + 400 + 900]
    assert len(ids) == 23 + 400 + 900 + text_tokens("what is in the pictures")
    assert ids[opening:ends[0]] == placeholder_ids("00000a0b", 400) == [0x00000a0b] * 400
    assert ids[ends[0]:ends[1]] == placeholder_ids("00000c0d", 900)
    assert ids[ends[1] - 1] != ids[ends[1]]                     # the text starts right after the last image


def test_completions_prompts_have_no_template_or_images():
    assert prompt_ids("a b c", [], False, 23) == prompt_ids("a b c", [], False, 0)
    assert len(prompt_ids("a b c", [], False, 23)) == 3
    assert image_end_positions([], 23) == []


def test_placeholders_carry_the_whole_image_hash_in_every_block():
    """Two images whose hashes share their first 12 hex digits still differ in every 16-token block that holds
    any of their tokens, the one shared with the template's opening included (a single token of the image)."""
    da, db = "00c0ffee1234aaaa", "00c0ffee1234bbbb"
    a, b = prompt_ids("same text", [(da, 400)], True, 23), prompt_ids("same text", [(db, 400)], True, 23)
    opening = 23 * 2 // 3
    assert a[:opening] == b[:opening] and opening % 16 == 15          # the first block: 15 template tokens + 1
    assert all(a[i:i + 16] != b[i:i + 16] for i in range(0, opening + 400, 16))
    assert block_hashes(a)[0] != block_hashes(b)[0]


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_image_size_reads_what_pil_reads(fmt):
    """A PNG's size from its IHDR (width first), any other format through PIL: a non-square image tells them apart."""
    buf = io.BytesIO()
    Image.new("RGB", (300, 120), (1, 2, 3)).save(buf, format=fmt)
    assert image_size(buf.getvalue()) == Image.open(io.BytesIO(buf.getvalue())).size == (300, 120)
    assert image_size(stand_in_image(random.Random(0), 84)) == (84, 84)
