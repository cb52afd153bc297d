"""Shared libraries built from csrc/ (simulator, collective engine). See setup.py."""
