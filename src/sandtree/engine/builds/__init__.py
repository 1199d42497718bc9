"""Builds: a Recipe (or a Dockerfile) executed as a chain of engine operations, each step one operation
on the previous step's image (builds.py), cached on the image DAG (cache.py). A COPY/ADD's files
(copies.py), a build context sent as a directory or tar (contexts.py), a Dockerfile on the host read as
a Recipe (dockerfiles.py)."""
