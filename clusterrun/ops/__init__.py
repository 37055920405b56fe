"""Operations on the nodes of an inventory or a run, beside `up`: exec, down, logs, init."""
