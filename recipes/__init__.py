"""Training recipes shipped with timm-posgeom (YAML; read with importlib.resources, see timm_posgeom.app.recipe)."""
