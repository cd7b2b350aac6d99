"""sim/tokenizer.py: chat prompt layout (template opening, image placeholders, text, closing)."""
from epdbench.sim.tokenizer import image_end_positions, prompt_ids, text_tokens


def test_image_placeholders_follow_the_template_opening_and_end_where_said():
    images = [("00000a0b", 400), ("00000c0d", 900)]
    ids = prompt_ids("what is in the pictures", images, True, 23)
    ends = image_end_positions(images, 23)
    opening = 23 * 2 // 3
    assert ends == [opening + 400, opening + 400 + 900]
    assert len(ids) == 23 + 400 + 900 + text_tokens("what is in the pictures")
    assert set(ids[opening:ends[0]]) == {0x00000a0b} and set(ids[ends[0]:ends[1]]) == {0x00000c0d}
    assert ids[ends[1] - 1] != ids[ends[1]]                     # the text starts right after the last image


def test_completions_prompts_have_no_template_or_images():
    assert prompt_ids("a b c", [], False, 23) == prompt_ids("a b c", [], False, 0)
    assert len(prompt_ids("a b c", [], False, 23)) == 3
    assert image_end_positions([], 23) == []
