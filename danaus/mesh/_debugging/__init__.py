"""The spawner's side of pdb in procs: the sessions of paused actors, and the relay of their messages up to the controller."""
