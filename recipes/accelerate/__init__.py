"""Accelerate launcher configs shipped with timm-posgeom (YAML)."""
