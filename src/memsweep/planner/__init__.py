"""The fastest technique combination that fits each GPU, predicted (mode=plan; app/plan.py runs it): space.py is
what is searched, search.py each combination on each GPU (refused by a rule, fitting or not), depth.py, batch.py,
twin.py and floor.py the shortcuts that keep hundreds of combinations fast, table.py the ranked tables."""
