"""Facts about nodes: parsers of tool output, a node's NICs, hints from NCCL and torch logs."""
