"""Starting a plan on its nodes and supervising it until every process is gone."""
