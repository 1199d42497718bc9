"""Images: how they come in (imports.py: a directory, tar, OCI layout, registry pull, Debian bootstrap;
uploads.py: bytes runs inject by reference), go out (oci.py: push, OCI layout), are looked into without
running (inspection.py), annotated (annotations.py), branched and merged (branching.py), made by the
engine writing files itself (edits.py) or from nothing (scratch.py), and the run defaults their config
gives (rundefaults.py)."""
