"""The experiments behind each paper's notebooks, one module per paper: leviathan (notebooks 02-04), specinfer (05),
medusa and medusa_ablation (06), chen (07), equality (greedy identity on a whole workload), and plots: the
notebooks' figures."""
