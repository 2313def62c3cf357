"""What every result of the library shares: its intervals (:mod:`.intervals`: over RPI permutations, a jackknife
over images), the one JSON writer and atomic write (:mod:`.jsonio`) and the helpers of its figures
(:mod:`.plotting`). The results themselves live beside their measures (``SSDCResult`` in :mod:`..probes`,
``FragilityResult`` in :mod:`..robustness`, ...). Nothing here imports torch or matplotlib at import time.
"""
