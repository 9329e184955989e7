from monarch.actor import Actor, debug_controller  # noqa: F401 - danaus has no debugger
