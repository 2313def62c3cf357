"""``python -m timm_posgeom.cli COMMAND ...`` (also under ``accelerate launch -m timm_posgeom.cli``)."""

import sys

from .main import main

sys.exit(main())
