"""pdb in a proc: the breakpoint hook, the session's channel to the spawner, and the debugger itself."""
