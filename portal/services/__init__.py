"""Every write: pages, the API and tasks call these functions, each one transaction, each change audited."""
