"""Load generator, benchmarks and the capacity planner (`laneway loadtest`, `laneway plan`)."""
