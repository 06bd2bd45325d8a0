"""The course's applications: simple_ml (hw0-hw4 training loops), mlp_resnet, models."""
