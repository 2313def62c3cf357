"""Model-card templates shipped with timm-posgeom (read with importlib.resources, see timm_posgeom.app.hub)."""
