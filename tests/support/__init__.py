"""Test fixtures shared by the tests (``tests/`` is on the path when pytest runs): random small
problems (``random_problems``) and the brute-force reference (``brute_force``)."""
