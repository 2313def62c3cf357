"""The SSDC probe, one idea in five modules: the formula (:mod:`.spearman`: ``ssdc``, the distance ranks), the
streaming probe (:mod:`.probe`: ``probe_ssdc``, its hooks and the reduction across processes), its running sums
(:mod:`.accumulator`: :class:`~.accumulator.Accumulator`, per-image :class:`~.accumulator.Moments`), the numbers
and intervals made from those sums (:mod:`.stats`: :func:`~.stats.finish` of a checked :class:`~.stats.Probe`)
and the result (:mod:`.result`: ``SSDCResult``).

The modules meet through those public names only; the batches, shards and devices of a stream are
:mod:`timm_posgeom.probes.streaming`'s, shared with every streaming measure. Users import from
:mod:`timm_posgeom.probes` (or the package root). Definitions: docs/method.md#ssdc.
"""
