"""Tools for people: danaus top, the dashboard, danaus debug; they reach a controller through its admin endpoint only."""
