"""MLflow: runs logged from the results folder, their state, the check that both agree, run history."""
