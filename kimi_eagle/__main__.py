import sys

from kimi_eagle.apps.cli import main

sys.exit(main())
