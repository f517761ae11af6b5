"""Shared pieces that know no portal model: input checks, shapes, words, bulk SQL, wake-ups."""
