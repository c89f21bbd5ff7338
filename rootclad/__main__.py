import sys

from rootclad.cli import main

sys.exit(main())
