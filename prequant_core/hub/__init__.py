"""The Hugging Face Hub, one concern a module: ``fetch`` (one file of a repo: already on disk, in the cache, or
downloaded), ``cache`` (the client's cache and offline mode), ``local`` (files already on disk: the download folder,
a mirror), ``transfer`` and ``child`` (one download in a child process running the real ``huggingface_hub`` client,
watched from here), ``errors`` (typed errors and what to do). Which candidate's file a load opens is the load
pipeline's step (``load/locate.py``). Callers import the module they use; this package re-exports nothing."""
