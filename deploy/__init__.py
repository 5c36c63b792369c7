"""Running Graylane's dependencies here: local Kafka and PostgreSQL without Docker, engine
servers, Prometheus rules, images and Kubernetes manifests.

Room: the deployment helpers of the service layer. May import the library and itself;
no service, no ``app``.
"""
