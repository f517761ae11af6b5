"""Sign-in beyond passwords: single sign-on (OpenID Connect) and a trusted proxy header."""
