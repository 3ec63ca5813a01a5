"""`python -m mwmq worker module:function --queue q`: see cli.py."""

import sys

from .cli import main

sys.exit(main())
