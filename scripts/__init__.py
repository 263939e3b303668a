"""Operator scripts run from a checkout (``python scripts/NAME.py``), not installed with the
package. A package only so their tests can sit at tests/scripts/ (tests/test_test_layout.py)."""
