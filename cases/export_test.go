package cases

// What the external tests (package cases_test) reach inside.
var (
	ContextExpr = contextExpr
	CatalogJSON = catalogJSON
)
