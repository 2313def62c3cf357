"""The application built on the library: what the ``posgeom`` command runs.

* :mod:`.recipe` - training recipes (shipped YAML and the user's own);
* :mod:`.train` - the accelerate training loop;
* :mod:`.study` - the whole study (train -> measure -> report per run);
* :mod:`.zoo` - many models measured into one table;
* :mod:`.records`, :mod:`.claims`, :mod:`.report` - typed records, the paper's claims decided, the report;
* :mod:`.hub` - exports, model cards and pushes in timm's Hub format; :mod:`.provenance` - versions.

The application imports the library, never the command line; the library never imports the application
(docs/architecture.md).
"""
