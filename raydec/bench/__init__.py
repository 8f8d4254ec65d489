"""`raydec bench`: one module per bench (engine, step, t2i, caption, pipeline), the arguments
and tables they share (``common``) and the command that knows them all (``cli``)."""
