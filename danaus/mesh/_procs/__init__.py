"""Procs on a host: starting them (here, through a fork server, or by a host agent), holding them, their output."""
