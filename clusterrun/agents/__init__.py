"""clusterrun's side of the node agent (clusterrun/remote/agent.py): one package for how it is told and heard.

=========== =====================================================================================================
spec.py     one function per agent mode that builds its spec (``protocol.RUN``, ``CHECK``, ``EXEC``,
            ``COLLECT``, ``SWEEP``, ``PS``): the only place clusterrun composes what a node is told
link.py     a started agent: ``prepare`` then ``go`` (:class:`AgentLink`), and any other mode started or run with
            its spec on stdin
collect.py  ``collect``: a run's missing rank log lines (and what is left of it) from one node
sweep.py    ``sweep`` and ``ps``: stop or list what is left of a run on one node
=========== =====================================================================================================

Every answer is read with :mod:`clusterrun.remote.protocol`'s frame decoder, then once into its typed answer
(:mod:`clusterrun.remote.answers`: one spec per event kind; :mod:`clusterrun.remote.decode`) where frames are read.
"""
