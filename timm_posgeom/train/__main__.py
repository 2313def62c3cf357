"""``python -m timm_posgeom.train`` (also under ``accelerate launch -m timm_posgeom.train``)."""
import sys

from .cli import main

sys.exit(main())
