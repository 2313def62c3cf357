"""PE-variant ViTs registered with timm (importing this module registers them), and :func:`.factory.create_model`:
a model to measure from any source (a timm name, ``hf-hub:``, ``local-dir:``)."""

from .vision_transformer_pe import PosGeomViT

__all__ = ["PosGeomViT", "list_models"]


def list_models(pattern: str = "*") -> list[str]:
    """Every model this plugin registers with timm, e.g. ``list_models('*micro*')``."""
    import timm

    return timm.list_models(pattern, module="vision_transformer_pe")
