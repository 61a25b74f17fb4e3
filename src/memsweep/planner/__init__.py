"""mode=plan (run.py): the fastest technique combination that fits each GPU (space.py: what is searched; search.py:
each combination on each GPU, refused by a rule, fitting or not; depth.py: a row's figures from a trace;
table.py: the ranked tables, plan.csv and plan.md)."""
