import sys

from epdbench.cli import main

sys.exit(main())
