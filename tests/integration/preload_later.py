"""A module that only the fork-server test of host agents' preloading notes (so that
whether a host's fork server imported it says whether the agent was told)."""
