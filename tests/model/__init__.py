"""Reference models and in-memory harnesses for the Hypothesis state machines in tests/unit
(test_model_*.py), and the settings profiles they run under."""
