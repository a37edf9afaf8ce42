"""What a person reads: the per-iteration history and its cost, the table, the offline HTML charts and a
token-by-token view of rollouts. May import anything below it."""
