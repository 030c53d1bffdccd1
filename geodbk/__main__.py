import sys

from geodbk.cli import main

sys.exit(main())
