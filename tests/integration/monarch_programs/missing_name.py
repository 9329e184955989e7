from monarch import Simulator  # noqa: F401 - danaus leaves Monarch's simulator out
