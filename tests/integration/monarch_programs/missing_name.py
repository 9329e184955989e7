from monarch import mast_reserve  # noqa: F401 - danaus leaves out Meta's scheduler
