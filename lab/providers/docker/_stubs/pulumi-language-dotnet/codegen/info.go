package codegen

// The C# language-extension records tfgen writes into the schema's "language.csharp" sections.
// The JSON names follow pulumi's dotnet codegen. The lab never generates a C# SDK from them.

// CSharpPackageInfo is the package-level "language.csharp" record.
type CSharpPackageInfo struct {
	PackageReferences            map[string]string `json:"packageReferences,omitempty"`
	Namespaces                   map[string]string `json:"namespaces,omitempty"`
	Compatibility                string            `json:"compatibility,omitempty"`
	DictionaryConstructors       bool              `json:"dictionaryConstructors,omitempty"`
	ProjectReferences            []string          `json:"projectReferences,omitempty"`
	RootNamespace                string            `json:"rootNamespace,omitempty"`
	LiftSingleValueMethodReturns bool              `json:"liftSingleValueMethodReturns,omitempty"`
	RespectSchemaVersion         bool              `json:"respectSchemaVersion,omitempty"`
}

// CSharpPropertyInfo renames a property in C#.
type CSharpPropertyInfo struct {
	Name string `json:"name,omitempty"`
}

// CSharpResourceInfo renames a resource in C#.
type CSharpResourceInfo struct {
	Name string `json:"name,omitempty"`
}
