"""Leaf utilities shared by every datamill capability; imports nothing else from datamill."""
