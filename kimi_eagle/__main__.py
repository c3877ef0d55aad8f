"""``python -m kimi_eagle``: the ``kimi-eagle`` command line (:func:`kimi_eagle.apps.cli.main`)."""
import sys

from kimi_eagle.apps.cli import main

sys.exit(main())
