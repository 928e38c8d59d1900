"""The Hugging Face Hub, one concern a module: ``fetch`` (which candidate's file: a local path, a file already on
disk, the cache, or a download; ``locate`` and ``download``), ``cache`` (the client's cache and offline mode),
``local`` (files already on disk: the download folder, a mirror), ``transfer`` and ``child`` (one download in a
child process running the real ``huggingface_hub`` client, watched from here), ``errors`` (typed errors and what to
do). Callers import the module they use; this package re-exports nothing."""
