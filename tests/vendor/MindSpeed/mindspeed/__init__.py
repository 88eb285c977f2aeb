"""Mindspeed is a distributed training platform."""
