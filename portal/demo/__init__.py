"""The demo: a simulated cluster file, teams, people per role and a trickle of requests."""
