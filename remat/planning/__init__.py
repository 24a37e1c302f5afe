"""Planning on the core, with no Thunder import: ``problem`` (the flow network), ``flow`` (one min-cut
algorithm per module), ``plan`` (a plan from a cut), ``budget`` (the Pareto frontier and budgets; they
return plans, the pipeline applies them), ``solve`` (plain networkx graphs) and ``reference`` (the exact
MILP for small graphs)."""
