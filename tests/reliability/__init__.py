"""The reliability suite (issue 7): fault injection, a history checker, scenarios.

See docs/reliability.md for what it measures and the failure model it checks.
"""
