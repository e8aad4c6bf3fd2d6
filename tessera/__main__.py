"""``python -m tessera`` runs ``tesserac``."""

import sys

from .cli import main

sys.exit(main())
