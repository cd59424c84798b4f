"""Multi-turn rollouts with tools (verl's ToolAgentLoop): hermes tool calls parsed (hermes.py), the tools of a verl
tool config file run (tools.py), turn after turn until an answer or a limit (loop.py)."""
