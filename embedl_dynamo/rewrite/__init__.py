"""The pattern engine: matches and verdicts, the matcher, the pattern protocols, the plan and the
engine that converts to a fixpoint, plans fusions longest first and applies them.
"""
